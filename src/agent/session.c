/*
 * The session layer (loom/session.h): the one path from a config to a
 * stored turn, under `loom run`, `loom serve` and every embedder.
 *
 * A turn is prepared in loom_turn_new without I/O beyond one store read:
 * the agent and model are resolved, the agent's config is mapped to run
 * options (turn_run_options: the only place that mapping exists), and the
 * run is created from those options, so a bad request fails before
 * anything is written. loom_turn_execute then does the store work the
 * model call needs (create the conversation, or load its history,
 * summary and plan), gives the run its history, runs it, stores the turn
 * and logs the final event. A busy store is retried with a backoff for
 * store_retry_ms.
 *
 * Events flow run -> recorder (with a store: it keeps what is stored) ->
 * the turn's sink (log, hold the final event) -> the caller's sink. The final
 * event (run.completed or run.failed) is held until the store has answered: a
 * turn that could not be stored ends with a run.failed whose code is
 * "store_failed" instead of run.completed.
 *
 * The log keeps every event serialized once, in order, so any number of
 * readers can replay it from any seq and follow it live (a wake callback
 * per watcher). It is bounded by log_max_bytes: past it the turn is
 * cancelled and only its final event is still logged.
 */
#include "loom/session.h"
#include "agent/events.h"
#include "agent/model_opts.h"
#include "agent/prompt.h"
#include "agent/research.h"
#include "agent/run_internal.h"
#include "agent/session_internal.h"
#include "agent/subagent.h"
#include "core/clock.h"
#include "core/config_internal.h"
#include "core/error.h"
#include "core/fiber.h"
#include "core/text.h"
#include "core/utf8.h"
#include "loom/log.h"
#include "loom/memory.h"
#include "loom/recorder.h"
#include "tools/registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Backoff between attempts of a store call that failed with LOOM_EIO. */
#define STORE_BACKOFF_MIN_MS 50
#define STORE_BACKOFF_MAX_MS 1000

/* What the executing thread is doing; loom_turn_cancel reads it. */
enum { PH_PREPARED = 0, PH_PREPARING, PH_EXECUTING, PH_STORING, PH_ENDED };

struct loom_session {
    atomic_int refs;
    loom_session_options o;
    const loom_config *cfg;
    loom_config *own_cfg;
    const loom_tool_registry *tools;
    loom_tool_registry *own_tools;
    char *default_model;
    atomic_long store_retry_ms;
    /* The agents some agent offers as tools (sub_agents): name -> true. */
    json_t *agent_tools;
    /* Without a lookup of the options': one adapter per configured
     * provider, shared by every turn's routers (session_adapters). */
    pthread_mutex_t adapters_mu;
    int adapters_state;       /* ADAPTERS_*, under adapters_mu */
    loom_provider **adapters; /* nadapters of them, once READY */
    /* Kept here: a turn's thread may free the session after its caller
     * freed a borrowed config. */
    size_t nadapters;
};

enum { ADAPTERS_UNTRIED = 0, ADAPTERS_READY, ADAPTERS_OFF };

typedef struct {
    loom_turn_wake_fn wake;
    void *payload;
} watcher;

/*
 * An agent a turn's run was handed over to (handoffs): what its run
 * options borrow, kept until the turn is freed.
 */
typedef struct handed {
    struct handed *next;
    char **tool_names;
    size_t ntool_names;
    loom_run_handoff *handoffs;
    loom_provider *router;
    loom_model_request_options mreq;
    loom__run_context ctxs;
} handed;

/* A model the run switched to (an agent's get_model hook), kept for the
 * turn's life: the run borrows it. */
typedef struct {
    char *name;            /* as the hook gave it */
    char *model;           /* resolved: "provider/model" */
    loom_provider *router; /* NULL: the session's own provider */
    loom_model_request_options req;
} turn_model;

struct loom_turn {
    atomic_int refs;
    loom_session *s;
    char *id;
    char *conversation_id;
    char *model;
    char *upstream;
    char *agent;
    const loom_agent_config *agent_cfg;
    /* A sub-agent's turn: its place under its parent; 0 depth: a top
     * turn (which makes the tree). */
    loom__agent_tree *tree;
    int depth;
    int elicitation; /* someone answers the tree's forms */
    const loom_cancel *parent_cancel;
    loom__spend *parent_spend; /* a reference: the parent's budget */
    char *parent_run_id;  /* a child's: its parent's run */
    char *parent_call_id; /* and the call that started it */
    int64_t started_ms;   /* Unix ms, when executing began */
    /* what the run options borrow */
    char *system_prompt;
    char *user_id;
    json_t *user_keys;
    json_t *user_settings; /* a top turn's copy, a child's tree's */
    char **tool_names;
    size_t ntool_names;
    char *choice_fn;
    loom_tool_def *client_defs;
    size_t nclient;
    json_t *client_json; /* names, descriptions and parameters kept */
    loom_llm_params params;
    loom_provider *router;
    loom_model_request_options mreq;
    loom__run_context ctxs;
    turn_model *alts; /* models the run switched to (turn_resolve) */
    size_t nalts;
    /* handoffs: the turn's agent's, the agents handed over to, and the
     * request's own settings, which hold for them too */
    loom_run_handoff *handoffs;
    handed *handed;
    long req_max_output;
    loom_opt_bool req_parallel;
    /* the turn's messages and what the conversation carries */
    loom_messages input;
    loom_messages *given_history; /* NULL: load from the store */
    char *stored_summary;
    size_t stored_covers;
    json_t *stored_plan;
    char *memories; /* the memories section, NULL: none */
    int create_conversation;
    int save_creates; /* op_save creates the conversation with the turn */
    int load_history;
    loom_run *lr;
    /* A research turn's research (research.h): freed after the run. */
    loom__research *research;
    json_t *research_opts; /* the request's research overrides, or NULL */
    loom_recorder *rec;
    loom_sink sink; /* the caller's */
    void (*ending)(loom_turn *t, void *payload);
    void *ending_payload;
    atomic_int phase;
    /* the outcome, written by the executing thread before ended */
    int stored;
    int failed_here;
    const char *fail_code;
    char *store_error;
    /* the held final event */
    loom_event_type term_type;
    uint64_t term_seq;
    uint32_t term_index;
    json_t *term_data;
    /* the log, guarded by lock */
    pthread_mutex_t lock;
    loom__cond cv; /* parks a waiter on a fiber */
    int log;
    size_t log_max;
    loom_turn_event **events;
    size_t nevents, capevents;
    loom_buf evtext; /* an event's text being made (the sink's thread) */
    size_t bytes;
    int overflow;
    int done;  /* the outcome is final (set before `ending` is called) */
    int ended; /* ended: set after `ending` */
    watcher *watchers;
    size_t nwatch, capwatch;
    /* Resumable research (loom_turn_options.resumable): kept in the
     * store as it goes; resuming a stored run; cut short by
     * loom_turn_interrupt (nothing more is logged or stored); the request
     * as stored (spec). */
    int durable;
    int resuming;
    atomic_int interrupted;
    json_t *spec;
};

static char *dup_or_null(const char *s, int *oom)
{
    char *d = s ? strdup(s) : NULL;

    if (s && !d)
        *oom = 1;
    return d;
}

/* ---- the session --------------------------------------------------------- */

/* Adds "<file>:<line>: agents.X.tools: unknown tool 'Y'" to e (no file
 * and line when the config did not come from one), with the available
 * tools when names is not NULL. */
static void unknown_tool(loom__config_errors *e, const loom_config *c,
                         const loom_agent_config *a, size_t j,
                         const char *names)
{
    size_t line = a->tools_lines ? a->tools_lines[j] : 0;
    char at[32] = "";

    if (c->source && line)
        snprintf(at, sizeof(at), ":%zu: ", line);
    loom__config_errors_add(
        e, LOOM_EINVALID, "%s%sagents.%s.tools: unknown tool '%s'%s%s%s",
        at[0] ? c->source : "", at, a->name, a->tools[j],
        names ? " (available: " : "", names ? names : "", names ? ")" : "");
}

/* Whether name is `prefix*` and tool starts with prefix. */
static int pattern_match(const char *name, const char *tool)
{
    size_t n = strlen(name);

    return n > 1 && name[n - 1] == '*' && strncmp(name, tool, n - 1) == 0;
}

/* Whether name (or pattern) is one of an MCP server's (`<server>__...`)
 * whose tools are not registered (it was not available at start): such a
 * name stands while its server is down. */
static int mcp_name(const loom_config *c, const loom_tool_registry *reg,
                    const char *name)
{
    size_t nreg = reg ? loom_tool_registry_count(reg) : 0;

    for (size_t i = 0; i < c->mcp_servers_len; i++) {
        size_t n = strlen(c->mcp_servers[i].name);
        if (strncmp(name, c->mcp_servers[i].name, n) != 0 ||
            strncmp(name + n, "__", 2) != 0)
            continue;
        for (size_t j = 0; j < nreg; j++)
            if (strncmp(loom_tool_registry_at(reg, j)->name, name, n + 2) == 0)
                return 0;
        return 1;
    }
    return 0;
}

/* Whether an agent's tools entry names something: a registered tool, a
 * pattern matching one, or a name of a configured MCP server (one
 * started in the background claims its names). */
static int tool_entry_known(const loom_session *s, const char *name)
{
    size_t n = loom_tool_registry_count(s->tools);

    if (loom_tool_registry_get(s->tools, name) ||
        loom_tool_registry_claims(s->tools, name) ||
        mcp_name(s->cfg, s->tools, name))
        return 1;
    for (size_t i = 0; i < n; i++)
        if (pattern_match(name, loom_tool_registry_at(s->tools, i)->name))
            return 1;
    return 0;
}

/*
 * The agents' tools must exist; memory tools only where a store is. Every
 * unknown tool is reported, one per line as a config load reports its
 * errors, with the file and line of the entry when the config came from
 * one ("loom.yaml:9: agents.X.tools: unknown tool 'Y' (available: ...)";
 * the available tools on the first line only, so more lines fit the
 * message).
 */
static int check_agent_tools(const loom_session *s)
{
    const loom_config *c = s->cfg;
    loom__config_errors errs;
    char *names = NULL;

    loom__config_errors_init(&errs);
    for (size_t i = 0; i < c->agents_len; i++) {
        const loom_agent_config *a = &c->agents[i];
        for (size_t j = 0; j < a->tools_len; j++) {
            if (tool_entry_known(s, a->tools[j]) ||
                (!s->o.store && loom_memory_is_tool(a->tools[j])))
                continue;
            if (errs.count == 0 &&
                !(names = loom_tool_registry_names(s->tools))) {
                loom__config_errors_free(&errs);
                return LOOM_ENOMEM;
            }
            unknown_tool(&errs, c, a, j, errs.count == 0 ? names : NULL);
        }
    }
    free(names);
    return loom__config_errors_raise(&errs, NULL);
}

/* A tool of another registry offered through the session's own: calls
 * go to it, and the entry holds a reference on that registry. */
typedef struct {
    const loom_tool *tool;
    loom_tool_registry *base;
} forward;

static int forward_execute(const json_t *args, const loom_tool_ctx *ctx,
                           loom_buf *out, void *payload)
{
    const forward *f = payload;

    return f->tool->execute(args, ctx, out, f->tool->payload);
}

static void forward_free(void *payload)
{
    forward *f = payload;

    if (f)
        loom_tool_registry_free(f->base);
    free(f);
}

/* The session's own registry offering every tool of the embedder's. */
static int forward_tools(loom_session *s)
{
    int rc;

    if ((rc = loom_tool_registry_new(&s->own_tools)) != 0)
        return rc;
    for (size_t i = 0; i < loom_tool_registry_count(s->tools); i++) {
        const loom_tool *b = loom_tool_registry_at(s->tools, i);
        loom_tool tool = *b;
        forward *f = calloc(1, sizeof(*f));
        if (!f)
            return loom__error_oom();
        f->tool = b;
        f->base = loom__tool_registry_ref(s->tools);
        tool.version = LOOM_TOOL_VERSION;
        tool.execute = forward_execute;
        tool.payload = f;
        tool.free_payload = forward_free;
        if ((rc = loom_tool_registry_add(s->own_tools, &tool)) != 0) {
            forward_free(f);
            return rc;
        }
    }
    /* The MCP servers started in the background come along. */
    if ((rc = loom__tool_registry_carry_sources(s->own_tools, s->tools)) != 0)
        return rc;
    s->tools = s->own_tools;
    return 0;
}

/*
 * Every agent some agent lists in sub_agents becomes a tool of the
 * session named after it (offered only to the agents that list it, see
 * offered()). An embedder's registry is not changed: the session then
 * offers its tools through one of its own.
 */
static int add_agent_tools(loom_session *s)
{
    const loom_config *c = s->cfg;
    const char *name;
    json_t *v;
    int rc;

    if (!(s->agent_tools = json_object()))
        return loom__error_oom();
    for (size_t i = 0; i < c->agents_len; i++)
        for (size_t j = 0; j < c->agents[i].sub_agents_len; j++)
            if (json_object_set_new(s->agent_tools, c->agents[i].sub_agents[j],
                                    json_true()) != 0)
                return loom__error_oom();
    if (!json_object_size(s->agent_tools))
        return 0;
    if (!s->own_tools && (rc = forward_tools(s)) != 0)
        return rc;
    json_object_foreach(s->agent_tools, name, v)
    {
        rc =
            loom__agent_tool_add(s->own_tools, s, name, NULL, NULL, NULL, 0, 0);
        if (rc == LOOM_EEXISTS)
            return loom__error_set(LOOM_EINVALID,
                                   "agent '%s' is offered as a tool "
                                   "(sub_agents), but a tool of that name "
                                   "exists",
                                   name);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int loom_session_new(loom_session **out, const loom_session_options *opts)
{
    loom_session *s;
    int rc;

    *out = NULL;
    if (!opts ||
        (opts->version != LOOM_SESSION_OPTIONS_VERSION && opts->version != 0))
        return loom__error_set(LOOM_EINVALID, "session options: bad version");
    if (opts->provider && !opts->model)
        return loom__error_set(LOOM_EINVALID,
                               "session options: a provider needs a model");
    if (!(s = calloc(1, sizeof(*s))))
        return loom__error_oom();
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->adapters_mu, NULL);
    s->o = *opts;
    atomic_init(&s->store_retry_ms, opts->store_retry_ms
                                        ? opts->store_retry_ms
                                        : LOOM_SESSION_STORE_RETRY_MS);
    if (opts->config) {
        s->cfg = opts->config;
    } else {
        if ((rc = loom_config_load_string(&s->own_cfg, "{}", "session")) != 0)
            goto fail;
        s->cfg = s->own_cfg;
    }
    if (opts->tools) {
        s->tools = opts->tools;
    } else {
        if ((rc = loom_tools_new_from_config(&s->own_tools, s->cfg)) != 0 ||
            (opts->store &&
             (rc = loom_tools_add_memory(s->own_tools, opts->store)) != 0))
            goto fail;
        s->tools = s->own_tools;
    }
    if ((rc = add_agent_tools(s)) != 0 || (rc = check_agent_tools(s)) != 0)
        goto fail;
    if (opts->default_model) {
        if (!(s->default_model = strdup(opts->default_model))) {
            rc = loom__error_oom();
            goto fail;
        }
    } else if (!opts->provider && (rc = loom_config_default_model(
                                       &s->default_model, s->cfg)) != 0) {
        goto fail;
    }
    *out = s;
    return 0;
fail:
    loom_session_free(s);
    return rc;
}

void loom__session_ref(loom_session *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void loom_session_free(loom_session *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    loom_tool_registry_free(s->own_tools);
    json_decref(s->agent_tools);
    for (size_t i = 0; s->adapters && i < s->nadapters; i++)
        loom_provider_free(s->adapters[i]);
    free(s->adapters);
    pthread_mutex_destroy(&s->adapters_mu);
    loom_config_free(s->own_cfg);
    free(s->default_model);
    free(s);
}

const loom_config *loom_session_config(const loom_session *s)
{
    return s->cfg;
}

const loom_tool_registry *loom_session_tools(const loom_session *s)
{
    return s->tools;
}

loom_store *loom_session_store(const loom_session *s)
{
    return s->o.store;
}

const char *loom_session_default_model(const loom_session *s,
                                       const loom_agent_config *agent)
{
    if (s->o.provider)
        return s->o.model;
    if (agent && agent->model)
        return agent->model;
    return s->default_model;
}

int loom_session_check_params(const loom_session *s, const char *agent,
                              const char *model, const loom_llm_params *p,
                              const char **param)
{
    const loom_agent_config *ac = NULL;
    const loom_model_config *m = NULL;
    const loom_provider_config *pc;
    loom_model_config tmp;
    char *resolved = NULL;
    int rc;

    if (param)
        *param = NULL;
    /* An embedder's provider decides for itself. */
    if (!loom_llm_params_any(p) || s->o.provider)
        return 0;
    if (agent && !(ac = loom_config_agent(s->cfg, agent)))
        return loom__error_set(LOOM_ENOTFOUND, "no agent named '%s'", agent);
    /* The model as a turn resolves it: "agent/<name>", a bare name. */
    if (model) {
        const loom_agent_config *named = NULL;
        if ((rc = loom_session_resolve_model(s, model, &named, &resolved)) != 0)
            return rc;
        if (named)
            ac = named;
        model = resolved;
    }
    if (!agent && !ac && s->cfg->default_agent)
        ac = loom_config_agent(s->cfg, s->cfg->default_agent);
    if (!model)
        model = loom_session_default_model(s, ac);
    if (!model) {
        free(resolved);
        return loom__error_set(LOOM_EINVALID,
                               "no model provider is configured");
    }
    memset(&tmp, 0, sizeof(tmp));
    if ((rc = loom_config_model(&m, &tmp, s->cfg, model)) != 0) {
        free(resolved);
        return rc;
    }
    pc = loom_config_provider(s->cfg, m->provider);
    rc = pc ? loom_llm_params_check(p, pc->name, pc->kind, param)
            : loom__error_set(LOOM_ENOTFOUND,
                              "model '%s': provider '%s' is not configured",
                              model, m->provider);
    loom_model_config_clear(&tmp);
    free(resolved);
    return rc;
}

void loom_session_set_store_retry_ms(loom_session *s, long ms)
{
    atomic_store(&s->store_retry_ms, ms);
}

int loom_session_store_retry(loom_session *s, loom_store_op_fn op, void *arg,
                             const char *what)
{
    long long deadline = loom__mono_ms() + atomic_load(&s->store_retry_ms);
    long wait = STORE_BACKOFF_MIN_MS;
    int rc;

    for (;;) {
        long long left;
        if ((rc = op(arg)) != LOOM_EIO)
            return rc;
        left = deadline - loom__mono_ms();
        if (left <= 0)
            return rc;
        if (wait > left)
            wait = (long)left;
        if (s->o.observer.store_retry)
            s->o.observer.store_retry(what, s->o.observer.payload);
        loom_warn("store: %s failed (%s); retrying in %ld ms", what,
                  loom_error_last(), wait);
        loom__fiber_sleep(wait); /* parks a fiber */
        wait =
            wait * 2 > STORE_BACKOFF_MAX_MS ? STORE_BACKOFF_MAX_MS : wait * 2;
    }
}

/* ---- refcounting --------------------------------------------------------- */

void loom_turn_ref(loom_turn *t)
{
    atomic_fetch_add(&t->refs, 1);
}

/* An event and its text are one allocation (event_new). */
static void event_free(loom_turn_event *e)
{
    if (e)
        json_decref((json_t *)e->json);
    free(e);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static void handed_free(handed *h)
{
    free_names(h->tool_names, h->ntool_names);
    free(h->handoffs);
    loom__run_context_free(&h->ctxs);
    loom_provider_free(h->router);
    free(h);
}

static void turn_free(loom_turn *t)
{
    for (size_t i = 0; i < t->nevents; i++)
        event_free(t->events[i]);
    free(t->events);
    loom_buf_free(&t->evtext);
    free(t->watchers);
    json_decref(t->term_data);
    free(t->store_error);
    loom_recorder_free(t->rec);
    loom_run_free(t->lr);
    loom__research_free(t->research);
    json_decref(t->research_opts);
    json_decref(t->spec);
    free(t->stored_summary);
    json_decref(t->stored_plan);
    free(t->memories);
    loom__agent_tree_free(t->tree);
    loom__spend_free(t->parent_spend);
    loom__run_context_free(&t->ctxs);
    loom_provider_free(t->router);
    free(t->handoffs);
    while (t->handed) {
        handed *h = t->handed;
        t->handed = h->next;
        handed_free(h);
    }
    for (size_t i = 0; i < t->nalts; i++) {
        loom_provider_free(t->alts[i].router);
        free(t->alts[i].model);
        free(t->alts[i].name);
    }
    free(t->alts);
    loom_messages_free(&t->input);
    if (t->given_history) {
        loom_messages_free(t->given_history);
        free(t->given_history);
    }
    free_names(t->tool_names, t->ntool_names);
    free(t->choice_fn);
    free(t->client_defs);
    json_decref(t->client_json);
    loom_llm_params_clear(&t->params);
    json_decref(t->user_keys);
    json_decref(t->user_settings);
    free(t->system_prompt);
    free(t->user_id);
    free(t->parent_run_id);
    free(t->parent_call_id);
    free(t->upstream);
    free(t->model);
    free(t->agent);
    free(t->conversation_id);
    free(t->id);
    pthread_mutex_destroy(&t->lock);
    loom__cond_destroy(&t->cv);
    loom_session_free(t->s);
    free(t);
}

void loom_turn_free(loom_turn *t)
{
    if (t && atomic_fetch_sub(&t->refs, 1) == 1)
        turn_free(t);
}

/* ---- accessors ----------------------------------------------------------- */

const char *loom_turn_id(const loom_turn *t)
{
    return t->id;
}

const char *loom_turn_conversation_id(const loom_turn *t)
{
    return t->conversation_id;
}

const char *loom_turn_model(const loom_turn *t)
{
    return t->model;
}

const char *loom_turn_agent(const loom_turn *t)
{
    return t->agent;
}

const char *loom_turn_user(const loom_turn *t)
{
    return t->user_id;
}

int loom_turn_ended(const loom_turn *t)
{
    loom_turn *m = (loom_turn *)t;
    int e;

    pthread_mutex_lock(&m->lock);
    e = m->ended;
    pthread_mutex_unlock(&m->lock);
    return e;
}

/* The outcome is final: from the `ending` callback on. */
static int turn_done(const loom_turn *t)
{
    loom_turn *m = (loom_turn *)t;
    int d;

    pthread_mutex_lock(&m->lock);
    d = m->done;
    pthread_mutex_unlock(&m->lock);
    return d;
}

loom_run_status loom_turn_status(const loom_turn *t)
{
    if (!turn_done(t))
        return LOOM_RUN_RUNNING;
    return t->failed_here ? LOOM_RUN_FAILED : loom_run_status_get(t->lr);
}

int loom_turn_stored(const loom_turn *t)
{
    return turn_done(t) && t->stored;
}

const char *loom_turn_store_error(const loom_turn *t)
{
    return turn_done(t) ? t->store_error : NULL;
}

const char *loom_turn_error_code(const loom_turn *t)
{
    return turn_done(t) && t->failed_here ? t->fail_code : NULL;
}

const loom_run *loom_turn_run(const loom_turn *t)
{
    return turn_done(t) ? t->lr : NULL;
}

/* Lock-free, so a signal handler or a server's ticker may call it: the
 * run exists from loom_turn_new on, and its cancel is a flag. */
int loom_turn_cancel(loom_turn *t)
{
    int active;

    if (!t)
        return 0;
    /* Read first: the cancel wakes a run parked on a fiber at once, and
     * it may be storing its turn before this returns. */
    active = atomic_load(&t->phase) < PH_STORING;
    loom_run_cancel(t->lr);
    return active;
}

/* The turn's own run first; else the live sub-agent runs below it (the
 * tree knows them). */
int loom_turn_approve_in(loom_turn *t, const char *run_id, const char *call_id,
                         int approve, const char *reason)
{
    int rc;

    if (!t || !call_id)
        return loom__error_set(LOOM_EINVALID, "approve: no turn or call id");
    if (!run_id || strcmp(run_id, t->id) == 0) {
        rc = loom_run_approve(t->lr, call_id, approve, reason);
        if (rc != LOOM_ENOTFOUND || run_id)
            return rc;
    }
    return loom__agent_tree_approve(t->tree, t->id, run_id, call_id, approve,
                                    reason);
}

int loom_turn_approve(loom_turn *t, const char *call_id, int approve,
                      const char *reason)
{
    return loom_turn_approve_in(t, NULL, call_id, approve, reason);
}

int loom_turn_answer_elicitation(loom_turn *t, const char *id,
                                 const char *action, const json_t *content)
{
    if (!t || !id)
        return loom__error_set(LOOM_EINVALID, "answer: no turn or id");
    if (!t->tree)
        return loom__error_set(
            LOOM_ENOTFOUND, "elicitation '%s' does not wait for an answer", id);
    return loom__elicits_answer(loom__agent_tree_elicits(t->tree), id, action,
                                content);
}

int loom_turn_interrupt(loom_turn *t)
{
    if (!t)
        return 0;
    if (!t->durable) {
        (void)loom_turn_cancel(t);
        return 0;
    }
    atomic_store(&t->interrupted, 1);
    loom_run_cancel(t->lr);
    return 1;
}

json_t *loom_turn_research_status(loom_turn *t)
{
    return t && t->research ? loom__research_status(t->research) : NULL;
}

int loom_turn_is_research(const loom_turn *t)
{
    return t && t->research;
}

int loom_turn_awaiting_approval(const loom_turn *t)
{
    return t && (loom_run_approvals_waiting(t->lr) > 0 ||
                 loom__agent_tree_waiting(t->tree, t->id) > 0);
}

int loom_turn_awaiting_input(const loom_turn *t)
{
    return loom_turn_awaiting_approval(t) ||
           (t && loom__elicits_waiting(loom__agent_tree_elicits(t->tree)) > 0);
}

int loom_turn_has_run(const loom_turn *t, const char *run_id)
{
    return t && run_id &&
           (strcmp(run_id, t->id) == 0 ||
            loom__agent_tree_has(t->tree, t->id, run_id));
}

/* ---- the event log ------------------------------------------------------- */

int loom_turn_watch(loom_turn *t, loom_turn_wake_fn wake, void *payload)
{
    int rc = 0;

    pthread_mutex_lock(&t->lock);
    if (t->nwatch == t->capwatch) {
        size_t c = t->capwatch ? t->capwatch * 2 : 4;
        watcher *w = realloc(t->watchers, c * sizeof(*w));
        if (w) {
            t->watchers = w;
            t->capwatch = c;
        } else {
            rc = loom__error_oom();
        }
    }
    if (!rc)
        t->watchers[t->nwatch++] = (watcher){wake, payload};
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void loom_turn_unwatch(loom_turn *t, loom_turn_wake_fn wake, void *payload)
{
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->nwatch; i++) {
        if (t->watchers[i].wake == wake && t->watchers[i].payload == payload) {
            t->watchers[i] = t->watchers[--t->nwatch];
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
}

/* Wakes every watcher; t->lock held (a wake only flags and signals). */
static void wake_watchers(loom_turn *t)
{
    for (size_t i = 0; i < t->nwatch; i++)
        t->watchers[i].wake(t->watchers[i].payload);
}

uint64_t loom_turn_last_seq(loom_turn *t, int *ended)
{
    uint64_t seq;

    pthread_mutex_lock(&t->lock);
    seq = t->nevents ? t->events[t->nevents - 1]->seq : 0;
    if (ended)
        *ended = t->ended;
    pthread_mutex_unlock(&t->lock);
    return seq;
}

/* Index of the first event with seq > after; t->lock held. */
static size_t first_after(const loom_turn *t, uint64_t after)
{
    size_t lo = 0, hi = t->nevents;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->events[mid]->seq <= after)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const loom_turn_event *loom_turn_next_event(loom_turn *t, uint64_t after_seq)
{
    const loom_turn_event *e = NULL;
    size_t i;

    pthread_mutex_lock(&t->lock);
    i = first_after(t, after_seq);
    if (i < t->nevents)
        e = t->events[i];
    pthread_mutex_unlock(&t->lock);
    return e;
}

const loom_turn_event *loom_turn_event_at(loom_turn *t, uint64_t seq)
{
    const loom_turn_event *e;

    if (seq == 0)
        return NULL;
    e = loom_turn_next_event(t, seq - 1);
    return e && e->seq == seq ? e : NULL;
}

int loom_turn_wait(loom_turn *t, uint64_t after_seq, long timeout_ms)
{
    double until =
        timeout_ms > 0 ? loom__mono_ms_exact() + (double)timeout_ms : -1;
    int ready, rc = 0;

    pthread_mutex_lock(&t->lock);
    for (;;) {
        ready = t->ended || first_after(t, after_seq) < t->nevents;
        if (ready || timeout_ms == 0 || rc == ETIMEDOUT)
            break;
        rc = loom__cond_wait(&t->cv, &t->lock, until);
    }
    pthread_mutex_unlock(&t->lock);
    return ready;
}

/* A log entry holding text (len bytes) in the same allocation; NULL
 * when out of memory (or for a text of 4 GiB or more). */
static loom_turn_event *event_new(const char *text, size_t len, uint64_t seq,
                                  loom_event_type type)
{
    loom_turn_event *e;
    char *copy;

    if (len > UINT32_MAX || !(e = malloc(sizeof(*e) + len + 1)))
        return NULL;
    copy = (char *)(e + 1);
    memcpy(copy, text, len);
    copy[len] = '\0';
    e->seq = seq;
    e->type = type;
    e->depth = 0;
    e->type_name = loom_event_type_name(type);
    e->text = copy;
    e->text_len = (uint32_t)len;
    e->delta_at = e->delta_len = 0;
    e->json = NULL;
    return e;
}

/*
 * Notes where e's text holds the JSON literal of its delta string v:
 * the text holds it (a compact dump writes a string the same wherever it
 * is), so any place it occurs is as good. Not noted when v holds U+0000
 * (a reader takes the string up to it), nor when out of memory.
 */
static void note_delta(loom_turn_event *e, const json_t *v)
{
    /* A literal longer than the text is not in it. */
    loom_buf lit = LOOM_BUF_INIT(e->text_len);
    const char *s = json_string_value(v), *at;
    size_t len = json_string_length(v);

    if (s && !memchr(s, '\0', len) &&
        loom__json_put_string(&lit, s, len) == 0 &&
        (at = memmem(e->text, e->text_len, lit.ptr, lit.len)) != NULL) {
        e->delta_at = (uint32_t)(at - e->text);
        e->delta_len = (uint32_t)lit.len;
    }
    loom_buf_free(&lit);
}

/* The facts e keeps beside its text (loom_turn_event), from j: the
 * event's data, or its JSON (which holds the data's members). */
static void note_facts(loom_turn_event *e, const json_t *j)
{
    loom_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.data = (json_t *)j;
    e->depth = loom_event_depth(&ev);
    if (e->type == LOOM_EV_MESSAGE_DELTA || e->type == LOOM_EV_REASONING_DELTA)
        note_delta(e, json_object_get(j, "delta"));
}

/* Whether e is the run's own end, whose JSON its entry keeps. */
static int run_end(const loom_turn_event *e)
{
    return (e->type == LOOM_EV_RUN_COMPLETED ||
            e->type == LOOM_EV_RUN_FAILED) &&
           e->depth == 0;
}

/* The log entry of event j (a reference it takes; NULL is out of
 * memory), serialized; NULL when out of memory. */
static loom_turn_event *event_of_json(json_t *j, uint64_t seq,
                                      loom_event_type type)
{
    size_t len = 0;
    char *text = j ? loom__json_compact_dumps(j, 15, &len) : NULL;
    loom_turn_event *e = text ? event_new(text, len, seq, type) : NULL;

    if (e) {
        note_facts(e, j);
        if (run_end(e)) {
            e->json = j;
            j = NULL;
        }
    }
    json_decref(j);
    free(text);
    return e;
}

/* The log entry of ev, its text written in b first; NULL when out of
 * memory. */
static loom_turn_event *event_in(loom_buf *b, const loom_event *ev)
{
    loom_turn_event *e;

    loom_buf_clear(b);
    if (loom__event_text(ev, b) != 0)
        return NULL;
    if ((e = event_new(b->ptr, b->len, ev->seq, ev->type)) != NULL) {
        note_facts(e, ev->data);
        /* The JSON its text is the dump of; NULL when out of memory
         * (readers parse the text then). */
        if (run_end(e))
            e->json = loom_event_to_json(ev);
    }
    return e;
}

/* The log entry of ev, serialized (written in t->evtext, which only the
 * thread that sends the turn's events uses); NULL when out of memory. */
LOOM_NOINLINE static loom_turn_event *event_of(loom_turn *t,
                                               const loom_event *ev)
{
    return event_in(&t->evtext, ev);
}

loom_turn_event *loom__turn_event_of(const loom_event *ev)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_TURN_LOG_DEFAULT_BYTES);
    loom_turn_event *e = event_in(&b, ev);

    loom_buf_free(&b);
    return e;
}

void loom__turn_event_free(loom_turn_event *e)
{
    event_free(e);
}

json_t *loom_turn_event_json(const loom_turn_event *e)
{
    /* The text may hold U+0000 in a string (\u0000). */
    return json_loadb(e->text, e->text_len, JSON_ALLOW_NUL, NULL);
}

/* Appends e to the log and wakes the readers; t->lock held. 0, or -1
 * when out of memory (e is then still the caller's). */
static int log_append(loom_turn *t, loom_turn_event *e)
{
    if (t->nevents == t->capevents) {
        size_t c = t->capevents ? t->capevents * 2 : 64;
        loom_turn_event **ne = realloc(t->events, c * sizeof(*ne));
        if (!ne)
            return -1;
        t->events = ne;
        t->capevents = c;
    }
    t->events[t->nevents++] = e;
    t->bytes += e->text_len;
    loom__cond_broadcast(&t->cv);
    wake_watchers(t);
    return 0;
}

typedef struct {
    loom_store *st;
    loom_store_research_write w;
} keep_arg;

static int op_keep(void *arg)
{
    keep_arg *a = arg;

    return loom_store_research_put(a->st, &a->w);
}

/* A durable turn's event goes to the store before the log: whatever a
 * reader saw is there when the turn resumes. A failure is logged; the
 * turn goes on. */
LOOM_NOINLINE static void keep_event(loom_turn *t, const loom_turn_event *e)
{
    keep_arg a;

    memset(&a, 0, sizeof(a));
    a.st = t->s->o.store;
    a.w.run_id = t->id;
    a.w.event_seq = e->seq;
    a.w.event = e->text;
    if (loom_session_store_retry(t->s, op_keep, &a, "save_research_event"))
        loom_warn("run %s: cannot store event %llu: %s", t->id,
                  (unsigned long long)e->seq, loom_error_last());
}

/* Logs ev (when the turn keeps a log); 1 when the turn must stop.
 * event_of and keep_event are LOOM_NOINLINE: their frames are gone before
 * log_append wakes the readers, the deepest point of a chunk's way down a
 * stream's fiber stack. */
static int log_event(loom_turn *t, const loom_event *ev, int force)
{
    loom_turn_event *e;
    int rc = 0;

    if (!t->log)
        return 0;
    /* An interrupted turn resumes later: its events stop here. */
    if (t->durable && atomic_load(&t->interrupted))
        return 1;
    if (!(e = event_of(t, ev)))
        return 1;
    if (t->durable)
        keep_event(t, e);
    pthread_mutex_lock(&t->lock);
    if (!force && (t->overflow || t->bytes + e->text_len > t->log_max)) {
        if (!t->overflow)
            loom_warn("run %s: event log passed %zu bytes: cancelling it",
                      t->id, t->log_max);
        t->overflow = 1;
        rc = 1;
    } else if (log_append(t, e) != 0) {
        rc = 1;
    } else {
        e = NULL;
    }
    pthread_mutex_unlock(&t->lock);
    event_free(e);
    return rc;
}

/*
 * The sink behind the recorder: logs each event and passes it on. The
 * final event is held for loom_turn_execute to log once the turn is
 * stored (a sub-agent's final event, nested in the stream, is not the
 * turn's). A non-zero return cancels the run.
 */
static int on_event(const loom_event *ev, void *payload)
{
    loom_turn *t = payload;
    int rc;

    if ((ev->type == LOOM_EV_RUN_COMPLETED || ev->type == LOOM_EV_RUN_FAILED) &&
        loom_event_depth(ev) == 0) {
        /* Only the executing thread calls the sink and reads this. */
        json_decref(t->term_data);
        t->term_data = json_incref(ev->data);
        t->term_type = ev->type;
        t->term_seq = ev->seq;
        t->term_index = ev->index;
        return 0;
    }
    rc = log_event(t, ev, 0);
    if (t->sink.emit && t->sink.emit(ev, t->sink.payload) != 0)
        rc = 1;
    return rc;
}

/* ---- preparing ----------------------------------------------------------- */

/* Whether agent (NULL: none) lists name in its sub_agents. */
static int lists_sub_agent(const loom_agent_config *agent, const char *name)
{
    for (size_t i = 0; agent && i < agent->sub_agents_len; i++)
        if (strcmp(agent->sub_agents[i], name) == 0)
            return 1;
    return 0;
}

/* Whether the turn offers tool `name` to agent (memory tools: see
 * loom/memory.h; a sub-agent's tool: to the agents that list it). */
static int offered(const loom_turn *t, const loom_agent_config *agent,
                   const char *name)
{
    json_t *as;
    int on;

    if (json_object_get(t->s->agent_tools, name))
        return lists_sub_agent(agent, name);
    as = agent ? json_boolean(agent->memory) : NULL;

    /* A memory tool that is not there (no store) is not offered. */
    if (loom_memory_is_tool(name) && !loom_tool_registry_get(t->s->tools, name))
        on = 0;
    else
        on = loom_memory_tool_offered(name, t->user_id, as, t->user_settings,
                                      t->s->cfg->tools);
    json_decref(as);
    return on == 1;
}

/*
 * Leaves the memory tools out of agent's tools (*names, *n: its list, or
 * NULL for every registered tool) when they may not be offered (no
 * store, no user, memory off for the agent or the tool): from the list,
 * or, when it offers every registered tool, by naming the others.
 */
static int keep_memory_choice(const loom_turn *t,
                              const loom_agent_config *agent, char ***names,
                              size_t *len)
{
    const loom_tool_registry *reg = t->s->tools;
    size_t n = reg ? loom_tool_registry_count(reg) : 0, k = 0;
    size_t nsrc = loom__tool_registry_source_count(reg);
    int hidden = 0;

    if (*names) {
        for (size_t i = 0; i < *len; i++) {
            if (offered(t, agent, (*names)[i]))
                (*names)[k++] = (*names)[i];
            else
                free((*names)[i]);
        }
        *len = k;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        hidden += !offered(t, agent, loom_tool_registry_at(reg, i)->name);
    if (!hidden)
        return 0;
    if (!(*names = calloc(n + nsrc + 1, sizeof(**names))))
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        const char *name = loom_tool_registry_at(reg, i)->name;
        if (!offered(t, agent, name))
            continue;
        if (!((*names)[*len] = strdup(name)))
            return loom__error_oom();
        (*len)++;
    }
    /* The tools of the MCP servers started in the background, by
     * pattern: the run's snapshot has them. */
    for (size_t i = 0; i < nsrc; i++) {
        if (asprintf(&(*names)[*len], "%s*",
                     loom__tool_registry_source_prefix(reg, i)) < 0) {
            (*names)[*len] = NULL;
            return loom__error_oom();
        }
        (*len)++;
    }
    return 0;
}

static int find_name(char *const *names, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return 1;
    return 0;
}

/* agent's sub_agents join its tool names (*names, *len from tool_names),
 * each once. */
static int add_sub_agents(char ***names, size_t *len,
                          const loom_agent_config *agent)
{
    char **more;

    if (!agent || !agent->sub_agents_len)
        return 0;
    if (!(more = realloc(*names,
                         (*len + agent->sub_agents_len + 1) * sizeof(*more))))
        return loom__error_oom();
    *names = more;
    for (size_t i = 0; i < agent->sub_agents_len; i++) {
        if (find_name(*names, *len, agent->sub_agents[i]))
            continue;
        if (!((*names)[*len] = strdup(agent->sub_agents[i])))
            return loom__error_oom();
        (*len)++;
    }
    (*names)[*len] = NULL;
    return 0;
}

/* agent's handoffs (none: NULL) into *out, each with its agent's
 * description; the strings are borrowed from cfg. */
static int agent_handoffs(const loom_config *cfg,
                          const loom_agent_config *agent,
                          loom_run_handoff **out)
{
    *out = NULL;
    if (!agent || !agent->handoffs_len)
        return 0;
    if (!(*out = calloc(agent->handoffs_len, sizeof(**out))))
        return loom__error_oom();
    for (size_t i = 0; i < agent->handoffs_len; i++) {
        const loom_agent_config *to =
            loom_config_agent(cfg, agent->handoffs[i]);
        (*out)[i].agent = agent->handoffs[i];
        (*out)[i].description = to ? to->description : NULL;
    }
    return 0;
}

/* Copies the client tools: the definitions point into t->client_json. */
static int keep_client_tools(loom_turn *t, const loom_turn_options *o)
{
    if (!o->client_tools_len)
        return 0;
    if (!(t->client_defs =
              calloc(o->client_tools_len, sizeof(*t->client_defs))) ||
        !(t->client_json = json_array()))
        return loom__error_oom();
    for (size_t i = 0; i < o->client_tools_len; i++) {
        const loom_tool_def *d = &o->client_tools[i];
        json_t *e =
            json_pack("{s:s,s:s?,s:O?}", "name", d->name, "description",
                      d->description, "parameters", (json_t *)d->parameters);
        if (!e || json_array_append_new(t->client_json, e) != 0)
            return loom__error_oom();
        t->client_defs[i].name = json_string_value(json_object_get(e, "name"));
        t->client_defs[i].description =
            json_string_value(json_object_get(e, "description"));
        t->client_defs[i].parameters = json_object_get(e, "parameters");
    }
    t->nclient = o->client_tools_len;
    return 0;
}

/* Adds name to t's tool names unless there already. */
static int add_tool_name(char **out, size_t *len, const char *name)
{
    for (size_t i = 0; i < *len; i++)
        if (strcmp(out[i], name) == 0)
            return 0;
    if (!(out[*len] = strdup(name)))
        return loom__error_oom();
    (*len)++;
    return 0;
}

/*
 * The part of pattern (`p*`) that falls to the source of prefix, as a
 * pattern of its own that starts with prefix (`files__*` for `fi*`, or
 * the pattern itself when it is narrower), into out (cap bytes); "" when
 * it does not claim it.
 */
static void source_pattern(char *out, size_t cap, const char *pattern,
                           const char *prefix)
{
    size_t n = strlen(pattern) - 1, p = strlen(prefix);

    out[0] = '\0';
    if (strncmp(pattern, prefix, n < p ? n : p) != 0)
        return;
    snprintf(out, cap, "%s", n < p ? prefix : pattern);
    if (n < p)
        snprintf(out + p, cap - p, "*");
}

/*
 * A turn's tool names (*out, *len_out; the caller frees them) from an agent's
 * list: a pattern (`files__*`) becomes the registered tools it matches,
 * and the name of an MCP server's tool that is not registered (its
 * server was not available at start) is left out, so the run goes on
 * without it. For the MCP servers started in the background the names
 * and patterns that are theirs stay as written (narrowed to the server's
 * tools): the run matches them against its snapshot.
 */
static int tool_names(const loom_session *s, char ***out, size_t *len_out,
                      const char *const *names, size_t n)
{
    const loom_tool_registry *reg = s->tools;
    size_t nreg = reg ? loom_tool_registry_count(reg) : 0;
    size_t nsrc = loom__tool_registry_source_count(reg);
    char narrow[256];
    int rc = 0;

    /* One extra slot so an empty list is still a list. */
    if (!(*out = calloc(n * (nsrc + 1) + nreg + 1, sizeof(**out))))
        return loom__error_oom();
    for (size_t i = 0; rc == 0 && i < n; i++) {
        size_t len = strlen(names[i]);
        if (len > 1 && names[i][len - 1] == '*') {
            for (size_t j = 0; rc == 0 && j < nreg; j++) {
                const char *tool = loom_tool_registry_at(reg, j)->name;
                if (pattern_match(names[i], tool))
                    rc = add_tool_name(*out, len_out, tool);
            }
            for (size_t j = 0; rc == 0 && j < nsrc; j++) {
                source_pattern(narrow, sizeof(narrow), names[i],
                               loom__tool_registry_source_prefix(reg, j));
                if (narrow[0])
                    rc = add_tool_name(*out, len_out, narrow);
            }
        } else if ((reg && loom_tool_registry_get(reg, names[i])) ||
                   loom_tool_registry_claims(reg, names[i]) ||
                   !mcp_name(s->cfg, reg, names[i])) {
            rc = add_tool_name(*out, len_out, names[i]);
        }
    }
    return rc;
}

/* Copies what the run options borrow into t. */
static int keep_spec(loom_turn *t, const loom_turn_options *o)
{
    const loom_agent_config *agent = t->agent_cfg;
    int oom = 0;

    t->model = dup_or_null(t->mreq.model, &oom);
    t->upstream = dup_or_null(t->mreq.upstream, &oom);
    t->agent = dup_or_null(agent ? agent->name : NULL, &oom);
    t->system_prompt = dup_or_null(o->system_prompt ? o->system_prompt
                                   : agent          ? agent->system_prompt
                                                    : NULL,
                                   &oom);
    if (o->tool_names_set || (agent && !agent->tools_all)) {
        const char *const *names = o->tool_names_set
                                       ? o->tool_names
                                       : (const char *const *)agent->tools;
        size_t n = o->tool_names_set ? o->tool_names_len : agent->tools_len;
        if (tool_names(t->s, &t->tool_names, &t->ntool_names, names, n) != 0 ||
            (!o->tool_names_set &&
             add_sub_agents(&t->tool_names, &t->ntool_names, agent) != 0))
            oom = 1;
    }
    if (o->tool_choice_set && o->tool_choice.function)
        t->choice_fn = dup_or_null(o->tool_choice.function, &oom);
    t->user_id = dup_or_null(o->user_id, &oom);
    if (o->user_keys && !(t->user_keys = json_deep_copy(o->user_keys)))
        oom = 1;
    /* A child follows its top turn's settings (set on the tree). */
    if (t->tree)
        t->user_settings =
            json_incref((json_t *)loom__agent_tree_user_settings(t->tree));
    else if (o->user_settings &&
             !(t->user_settings = json_deep_copy(o->user_settings)))
        oom = 1;
    if (!oom && loom_messages_append(&t->input, o->input) != 0)
        oom = 1;
    if (!oom && o->history) {
        if (!(t->given_history = calloc(1, sizeof(*t->given_history))) ||
            loom_messages_append(t->given_history, o->history) != 0)
            oom = 1;
    }
    if (!oom && loom_llm_params_copy(&t->params, o->params) != 0)
        oom = 1;
    if (oom)
        return loom__error_oom();
    t->req_max_output = o->max_output_tokens > 0 ? o->max_output_tokens : 0;
    t->req_parallel = o->parallel_tool_calls;
    if (keep_client_tools(t, o) ||
        agent_handoffs(t->s->cfg, agent, &t->handoffs) != 0)
        return LOOM_ENOMEM;
    return keep_memory_choice(t, agent, &t->tool_names, &t->ntool_names);
}

/* The agent's data policy (none: store everything) into the recorder. */
static int use_data_policy(loom_recorder *rec, const loom_agent_config *agent)
{
    static const char *const none[1] = {NULL};
    const loom_agent_data_policy *dp = agent ? &agent->data_policy : NULL;
    loom_data_policy p = {.version = LOOM_DATA_POLICY_VERSION};

    if (!dp)
        return 0;
    p.omit_text = dp->omit_text;
    p.omit_tool_calls = dp->omit_tool_calls;
    p.omit_tool_results = dp->omit_tool_results;
    if (dp->tools_set) {
        p.tools = dp->tools_len ? (const char *const *)dp->tools : none;
        p.tools_len = dp->tools_len;
    }
    return loom_recorder_set_policy(rec, &p);
}

/* The hooks the session was given for agent (NULL: none). */
static const loom_agent_hooks *agent_hooks(const loom_session *s,
                                           const char *agent)
{
    for (size_t i = 0; agent && i < s->o.agent_hooks_len; i++)
        if (s->o.agent_hooks[i].agent &&
            strcmp(s->o.agent_hooks[i].agent, agent) == 0)
            return s->o.agent_hooks[i].hooks;
    return NULL;
}

/* The session's adapter of the configured provider named name (the
 * routers' lookup once session_adapters said yes). */
static loom_provider *session_adapter(const char *name, void *payload)
{
    const loom_session *s = payload;

    for (size_t i = 0; i < s->cfg->providers_len; i++)
        if (strcmp(s->cfg->providers[i].name, name) == 0)
            return s->adapters[i];
    return NULL;
}

/*
 * Whether the turns' routers share the session's adapters: one per
 * configured provider, built at the first turn, so a session's turns
 * (a parent and its sub-agents, one turn after another) reuse the
 * adapters' connections and HTTP handles as `loom serve` does with its
 * own lookup. Only transport is shared: each router keeps its own
 * failure record (or the options' health). When any provider cannot be
 * built, nothing is shared and each router builds its own as before, so
 * it fails with that provider's own error.
 */
static int session_adapters(loom_session *s)
{
    const size_t n = s->cfg->providers_len;
    int ready;

    if (s->o.lookup || s->o.provider || n == 0)
        return 0;
    pthread_mutex_lock(&s->adapters_mu);
    if (s->adapters_state == ADAPTERS_UNTRIED) {
        size_t i = 0;
        s->adapters_state = ADAPTERS_OFF;
        if ((s->adapters = calloc(n, sizeof(*s->adapters))) != NULL)
            for (; i < n; i++)
                if (loom_provider_new(&s->adapters[i], &s->cfg->providers[i]) !=
                    0)
                    break;
        if (s->adapters && i == n) {
            s->adapters_state = ADAPTERS_READY;
            s->nadapters = n;
        } else {
            for (size_t k = 0; s->adapters && k < i; k++)
                loom_provider_free(s->adapters[k]);
            free(s->adapters);
            s->adapters = NULL;
            loom_error_clear();
        }
    }
    ready = s->adapters_state == ADAPTERS_READY;
    pthread_mutex_unlock(&s->adapters_mu);
    return ready;
}

static loom_router_options router_options(loom_session *s)
{
    loom_router_options rto = LOOM_ROUTER_OPTIONS_INIT;

    rto.health = s->o.health;
    rto.lookup = s->o.lookup;
    rto.lookup_payload = s->o.lookup_payload;
    if (session_adapters(s)) {
        rto.lookup = session_adapter;
        rto.lookup_payload = s;
    }
    return rto;
}

/* The router of a turn's model: model (resolved), else agent's, else
 * the session's default; with the session's own provider, the name is
 * the id sent to it. */
static int resolve_router(loom_session *s, const char *model,
                          const loom_agent_config *agent,
                          loom_provider **router,
                          loom_model_request_options *mreq)
{
    loom_router_options rto;
    const char *name = model ? model : loom_session_default_model(s, agent);

    if (s->o.provider) {
        memset(mreq, 0, sizeof(*mreq));
        mreq->model = model ? model : s->o.model;
        mreq->upstream = mreq->model;
        mreq->capabilities.tools = 1;
        mreq->capabilities.parallel_tool_calls = 1;
        return 0;
    }
    if (!name)
        return loom__error_set(LOOM_EINVALID,
                               "no model provider is configured");
    rto = router_options(s);
    return loom_router_new(router, s->cfg, name, &rto, mreq);
}

/*
 * The run's resolve_agent (loom_run_options.handoffs): o, the run's
 * options, becomes agent `name`'s as turn_run_options maps an agent:
 * its prompt, tools (memory tools as for the turn's agent), limits,
 * handoffs, hooks and model (its own, else the session's default). What
 * the request set for the run holds on (max_output_tokens,
 * parallel_tool_calls, temperature, parameters, client tools, user);
 * its system_prompt, tools, tool_choice and model were for the agent it
 * named. What o borrows is kept in t->handed until the turn is freed.
 */
static int handoff_agent(const char *name, loom_run_options *o, void *payload)
{
    loom_turn *t = payload;
    loom_session *s = t->s;
    const loom_agent_config *ac = loom_config_agent(s->cfg, name);
    loom_router_options rto = LOOM_ROUTER_OPTIONS_INIT;
    loom_run_context_options none = LOOM_RUN_CONTEXT_OPTIONS_INIT;
    handed *h;
    int rc;

    if (!ac)
        return loom__error_set(LOOM_ENOTFOUND, "no agent named '%s'", name);
    if (!(h = calloc(1, sizeof(*h))))
        return loom__error_oom();
    h->next = t->handed;
    t->handed = h;
    if ((rc = resolve_router(s, NULL, ac, &h->router, &h->mreq)) != 0 ||
        (!ac->tools_all &&
         ((rc = tool_names(s, &h->tool_names, &h->ntool_names,
                           (const char *const *)ac->tools, ac->tools_len)) !=
              0 ||
          (rc = add_sub_agents(&h->tool_names, &h->ntool_names, ac)) != 0)) ||
        (rc = keep_memory_choice(t, ac, &h->tool_names, &h->ntool_names)) !=
            0 ||
        (rc = agent_handoffs(s->cfg, ac, &h->handoffs)) != 0)
        return rc;
    o->agent = ac->name;
    o->system_prompt = ac->system_prompt;
    o->tools = s->tools;
    o->tool_names = (const char *const *)h->tool_names;
    o->tool_names_len = h->ntool_names;
    o->max_iterations = ac->max_iterations;
    o->tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
    o->tool_choice.function = NULL;
    o->parallel_tool_calls = t->req_parallel != LOOM_OPT_DEFAULT
                                 ? t->req_parallel
                             : ac->parallel_tool_calls ? LOOM_OPT_ON
                                                       : LOOM_OPT_OFF;
    o->tool_concurrency = ac->tool_concurrency;
    o->client_tools = t->client_defs;
    o->client_tools_len = t->nclient;
    o->max_output_tokens = t->req_max_output;
    o->tool_timeout_ms = 0;
    memset(&o->review, 0, sizeof(o->review));
    o->context = none;
    o->agent_hooks = agent_hooks(s, ac->name);
    o->handoffs = h->handoffs;
    o->handoffs_len = ac->handoffs_len;
    o->provider = s->o.provider ? s->o.provider : h->router;
    loom__run_options_use_model(o, &h->mreq);
    rto.health = s->o.health;
    rto.lookup = s->o.lookup;
    rto.lookup_payload = s->o.lookup_payload;
    /* The agent's tool_options go over the config's settings, not over
     * the agent's that handed over. */
    o->tool_settings = s->cfg->tools;
    if ((rc = loom__run_context_setup(&h->ctxs, o, s->cfg, &rto)) != 0)
        return rc;
    return loom__run_agent_setup(&h->ctxs, o, s->cfg, ac, &rto);
}

/* Routers of a session share its health record and adapters. */
static void fill_resolved(loom_resolved_model *out, const loom_turn *t,
                          const turn_model *m)
{
    out->provider = m->router ? m->router : t->s->o.provider;
    out->model = m->req.model;
    out->upstream_model = m->req.upstream;
    out->thinking_budget = m->req.thinking_budget;
    out->reasoning_effort = m->req.reasoning_effort;
}

/*
 * The run's resolve_model: a name an agent's get_model hook (or
 * model_after_retries) gives resolves as a turn's `model` does
 * (loom_session_resolve_model; an agent is not a model), to a router
 * kept until the turn is freed; with the session's own provider, the
 * name is the id sent to it.
 */
static int turn_resolve(loom_resolved_model *out, const char *name,
                        void *payload)
{
    loom_turn *t = payload;
    loom_session *s = t->s;
    const loom_agent_config *agent = NULL;
    loom_router_options rto = router_options(s);
    turn_model *p, *m;
    char *resolved = NULL;
    int rc;

    for (size_t i = 0; i < t->nalts; i++)
        if (strcmp(t->alts[i].name, name) == 0) {
            fill_resolved(out, t, &t->alts[i]);
            return 0;
        }
    if ((rc = loom_session_resolve_model(s, name, &agent, &resolved)) != 0)
        return rc;
    if (agent)
        return loom__error_set(LOOM_EINVALID,
                               "model '%s' names an agent, not a model", name);
    if (!(p = realloc(t->alts, (t->nalts + 1) * sizeof(*p)))) {
        free(resolved);
        return loom__error_oom();
    }
    t->alts = p;
    m = &t->alts[t->nalts];
    memset(m, 0, sizeof(*m));
    m->model = resolved;
    if (!(m->name = strdup(name))) {
        free(resolved);
        return loom__error_oom();
    }
    if (s->o.provider) {
        m->req.model = m->model;
        m->req.upstream = m->model;
    } else if ((rc = loom_router_new(&m->router, s->cfg, resolved, &rto,
                                     &m->req)) != 0) {
        free(m->name);
        free(resolved);
        return rc;
    }
    t->nalts++;
    fill_resolved(out, t, m);
    return 0;
}

/* A limit (0: none) becomes the tighter of itself and other. */
static void tighter(long *limit, long other)
{
    if (other > 0 && (*limit <= 0 || other < *limit))
        *limit = other;
}

static void tighter64(int64_t *limit, int64_t other)
{
    if (other > 0 && (*limit <= 0 || other < *limit))
        *limit = other;
}

/*
 * The one mapping of an agent's config and a turn's overrides to run
 * options, for every front end: into *ro, which the run copies (the
 * turn keeps no copy of its own: 776 bytes of every open stream).
 */
static int turn_run_options(loom_turn *t, const loom_turn_options *o,
                            loom_run_options *ro)
{
    const loom_agent_config *agent = t->agent_cfg;
    loom_session *s = t->s;
    loom_router_options rto = LOOM_ROUTER_OPTIONS_INIT;
    int rc;

    *ro = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    ro->run_id = t->id;
    ro->conversation_id = t->conversation_id;
    ro->provider = s->o.provider ? s->o.provider : t->router;
    ro->tools = s->tools;
    ro->tool_settings = s->cfg->tools;
    ro->agent = t->agent;
    ro->system_prompt = t->system_prompt;
    if (t->tool_names) {
        ro->tool_names = (const char *const *)t->tool_names;
        ro->tool_names_len = t->ntool_names;
    }
    ro->max_iterations = o->max_iterations > 0 ? o->max_iterations
                         : agent               ? agent->max_iterations
                                               : 0;
    if (agent) {
        ro->tool_choice = agent->tool_choice;
        ro->parallel_tool_calls =
            agent->parallel_tool_calls ? LOOM_OPT_ON : LOOM_OPT_OFF;
        ro->tool_concurrency = agent->tool_concurrency;
    }
    if (o->tool_choice_set) {
        ro->tool_choice.kind = o->tool_choice.kind;
        ro->tool_choice.function = t->choice_fn;
    }
    if (o->parallel_tool_calls != LOOM_OPT_DEFAULT)
        ro->parallel_tool_calls = o->parallel_tool_calls;
    ro->max_output_tokens = o->max_output_tokens > 0 ? o->max_output_tokens : 0;
    ro->temperature = o->temperature;
    ro->temperature_set = o->temperature_set;
    ro->client_tools = t->client_defs;
    ro->client_tools_len = t->nclient;
    if (loom_llm_params_any(&t->params))
        ro->params = &t->params;
    ro->user_id = t->user_id;
    ro->user_keys = t->user_keys;
    /* The user's instructions are for the answer they read: the top
     * turn's, not its sub-agents'. */
    if (t->depth == 0)
        ro->user_instructions = json_string_value(
            json_object_get(t->user_settings, "instructions"));
    ro->agent_hooks = agent_hooks(s, t->agent);
    if (agent) {
        ro->handoffs = t->handoffs;
        ro->handoffs_len = agent->handoffs_len;
        ro->resolve_agent = handoff_agent;
        ro->resolve_payload = t;
    }
    ro->resolve_model = turn_resolve;
    ro->resolve_model_payload = t;
    /* A title only for the conversation this turn starts in the store. */
    ro->title.enabled = o->title && t->create_conversation;
    ro->call_gate = o->call_gate;
    ro->budget = o->budget;
    ro->whole_answers = o->whole_answers;
    if (agent) {
        tighter64(&ro->budget.max_cost_micros, agent->budget_cost_micros);
        tighter(&ro->budget.max_tokens, agent->budget_tokens);
        tighter(&ro->budget.max_seconds, agent->budget_seconds);
    }
    loom__run_options_use_model(ro, &t->mreq);
    ro->model = t->model;
    ro->upstream_model = t->upstream;
    rto = router_options(s);
    if ((rc = loom__run_context_setup(&t->ctxs, ro, s->cfg, &rto)) != 0 ||
        (rc = loom__run_agent_setup(&t->ctxs, ro, s->cfg, agent, &rto)) != 0)
        return rc;
    /* The recorder keeps what the store saves: without a store the run's
     * events come straight to the turn's sink. */
    ro->sink = (loom_sink){on_event, t};
    if (s->o.store) {
        if ((rc = loom_recorder_new(&t->rec, ro->sink)) != 0 ||
            (rc = use_data_policy(t->rec, agent)) != 0)
            return rc;
        ro->sink = loom_recorder_sink(t->rec);
    }
    if (agent && agent->research &&
        (rc = loom__research_new(&t->research, s, s->cfg, t->research_opts,
                                 ro)) != 0)
        return rc;
    return 0;
}

int loom__session_model(loom_session *s, const char *model,
                        loom_provider **owned, loom_provider **use,
                        loom_model_request_options *mreq)
{
    int rc;

    *owned = NULL;
    *use = NULL;
    if ((rc = resolve_router(s, model, NULL, owned, mreq)) != 0)
        return rc;
    *use = s->o.provider ? s->o.provider : *owned;
    return 0;
}

/* The model: the session's own provider, else a router from the config. */
int loom_session_resolve_model(const loom_session *s, const char *name,
                               const loom_agent_config **agent_out,
                               char **model_out)
{
    const size_t plen = strlen(LOOM_AGENT_MODEL_PREFIX);
    char shown[64];

    *agent_out = NULL;
    *model_out = NULL;
    if (!name || !*name)
        return loom__error_set(LOOM_EINVALID, "model name: NULL or empty");
    if (strncmp(name, LOOM_AGENT_MODEL_PREFIX, plen) == 0) {
        if (!(*agent_out = loom_config_agent(s->cfg, name + plen)))
            return loom__error_set(
                LOOM_ENOTFOUND, "no agent named '%s'",
                loom__text_shown(shown, sizeof(shown), name + plen, 48));
        return 0;
    }
    if (s->o.provider)
        return (*model_out = strdup(name)) ? 0 : loom__error_oom();
    return loom_router_resolve_name(model_out, s->cfg, name, s->default_model);
}

/* The agent of the turn: the options' (by name or as "agent/<name>" in
 * model), else the default one unless no_agent. *model (the caller's) is
 * the options' model resolved, NULL when it named an agent or none. */
static int pick_agent(loom_turn *t, const loom_turn_options *o, char **model)
{
    loom_session *s = t->s;
    const loom_agent_config *named = NULL;
    int rc;

    *model = NULL;
    if (o->model &&
        (rc = loom_session_resolve_model(s, o->model, &named, model)) != 0)
        return rc;
    if (named && (o->agent || o->no_agent))
        return loom__error_set(LOOM_EINVALID,
                               "model '%s' names an agent, and the turn "
                               "names another (or none)",
                               o->model);
    if (o->agent && !(named = loom_config_agent(s->cfg, o->agent)))
        return loom__error_set(LOOM_ENOTFOUND, "no agent named '%s'", o->agent);
    if (!named && !o->no_agent && s->cfg->default_agent)
        named = loom_config_agent(s->cfg, s->cfg->default_agent);
    t->agent_cfg = named;
    return 0;
}

/*
 * A research turn's overrides (checked here, so a bad one fails the
 * request) and its supervisor model when the request names none: the
 * overrides' `model`, else the research section's, else the agent's.
 */
static int research_model(loom_turn *t, const loom_turn_options *o,
                          char **model)
{
    const json_t *m;
    const char *name;
    const loom_agent_config *named = NULL;
    int rc;

    if (!o->research)
        ;
    else if (!t->agent_cfg || !t->agent_cfg->research)
        return loom__error_set(LOOM_EINVALID,
                               "research options are for research agents "
                               "(such as " LOOM_RESEARCH_AGENT ")");
    else if ((rc = loom__research_check_overrides(o->research)) != 0 ||
             !(t->research_opts = json_deep_copy(o->research)))
        return rc ? rc : loom__error_oom();
    if (*model || !t->agent_cfg || !t->agent_cfg->research)
        return 0;
    m = json_object_get(o->research, "model");
    name = m ? json_string_value(m) : t->s->cfg->research.model;
    if (!name)
        return 0;
    if ((rc = loom_session_resolve_model(t->s, name, &named, model)) != 0)
        return rc;
    if (named)
        return loom__error_set(LOOM_EINVALID,
                               "research.model: '%s' names an agent", name);
    return 0;
}

static int pick_model(loom_turn *t, const char *model)
{
    return resolve_router(t->s, model, t->agent_cfg, &t->router, &t->mreq);
}

/*
 * The conversation's id: a new one (created when the turn executes), or
 * the one continued, which must exist. The check is a read: in WAL mode
 * it never waits for the store's writers.
 */
static int pick_conversation(loom_turn *t, const loom_turn_options *o)
{
    loom_store *st = t->s->o.store;
    char id[LOOM_ID_SIZE];
    int rc;

    if (o->create_with_save && o->conversation_id)
        return loom__error_set(LOOM_EINVALID,
                               "create_with_save is for a new conversation");
    if (!st) {
        if (o->conversation_id)
            return loom__error_set(LOOM_EINVALID,
                                   "a conversation needs a store");
        return 0;
    }
    if (!o->conversation_id) {
        if ((rc = loom_id_new(id, "conv_")) != 0)
            return rc;
        t->create_conversation = 1;
    } else {
        loom_conversation_info info;
        memset(&info, 0, sizeof(info));
        rc = loom_store_conversation_info(st, o->conversation_id, &info);
        loom_conversation_info_clear(&info);
        if (rc)
            return rc;
        t->load_history = !o->history;
    }
    t->conversation_id = strdup(o->conversation_id ? o->conversation_id : id);
    return t->conversation_id ? 0 : loom__error_oom();
}

/*
 * The turn's place in its tree of agent runs: a top turn makes the tree
 * with its agent's limits; a child turn joins its parent's.
 */
static int place_run(loom_turn *t)
{
    const loom_agent_config *a = t->agent_cfg;
    int rc;

    if (!t->tree &&
        ((rc = loom__agent_tree_new(&t->tree, t->s, a ? a->max_depth : 0,
                                    a ? a->max_sub_runs : 0)) != 0 ||
         (rc = loom__agent_tree_set_conversation(t->tree,
                                                 t->conversation_id)) != 0))
        return rc;
    if (t->depth == 0) {
        /* A form waits as long as a call waits for approval. */
        loom__elicits_set_open(loom__agent_tree_elicits(t->tree),
                               t->elicitation, a ? a->approval_timeout_ms : 0);
        loom__agent_tree_set_user_settings(t->tree, t->user_settings);
    }
    loom__run_set_place(t->lr, t->tree, t->depth,
                        a ? a->count_sub_agent_calls : 1, t->parent_cancel,
                        t->parent_spend);
    return 0;
}

/* The request of a durable turn as stored: what resuming it needs. */
static json_t *spec_json(const loom_turn *t, const loom_turn_options *o)
{
    json_t *in = json_array(), *spec;

    for (size_t i = 0; in && i < t->input.len; i++) {
        const loom_message *m = &t->input.items[i];
        if (json_array_append_new(
                in, json_pack("{s:s,s:s}", "role", loom_role_name(m->role),
                              "content", m->content ? m->content : "")) != 0) {
            json_decref(in);
            in = NULL;
        }
    }
    spec =
        json_pack("{s:s?,s:s?,s:o*,s:O?,s:s?,s:{s:s?,s:s?,s:s?,s:s?}}", "agent",
                  t->agent, "model", t->model, "input", in, "research",
                  o->research, "user_id", t->user_id, "account", "key_id",
                  o->account.key_id, "workspace", o->account.workspace, "user",
                  o->account.user, "end_user", o->account.end_user);
    /* The request's own budget holds for the resumed run too. */
    if (spec && loom__budget_any(&o->budget) &&
        json_object_set_new(
            spec, "budget",
            json_pack("{s:I,s:I,s:I}", "max_cost_micros",
                      (json_int_t)o->budget.max_cost_micros, "max_tokens",
                      (json_int_t)o->budget.max_tokens, "max_seconds",
                      (json_int_t)o->budget.max_seconds)) != 0) {
        json_decref(spec);
        spec = NULL;
    }
    return spec;
}

/* A research turn with a store and a log is kept in the store when it
 * is asked to be resumable (or resumes). */
static int make_durable(loom_turn *t, const loom_turn_options *o,
                        const loom__turn_child *child)
{
    if (!o->resumable && !o->resume)
        return 0;
    if (child || !t->research || !t->s->o.store || !t->log ||
        !t->conversation_id) {
        if (o->resume)
            return loom__error_set(LOOM_EINVALID,
                                   "only a research run with a store and an "
                                   "event log resumes");
        return 0;
    }
    if (o->resume && (!o->run_id || !o->conversation_id))
        return loom__error_set(LOOM_EINVALID, "resuming a research run needs "
                                              "its run and conversation ids");
    t->durable = 1;
    t->resuming = o->resume;
    if (!t->resuming && !(t->spec = spec_json(t, o)))
        return loom__error_oom();
    return 0;
}

static int turn_new(loom_turn **out, loom_session *s,
                    const loom_turn_options *o, const loom__turn_child *child)
{
    loom_turn *t;
    loom_run_options ro;
    char *model = NULL;
    int rc;

    *out = NULL;
    if (!o || (o->version != LOOM_TURN_OPTIONS_VERSION && o->version != 0))
        return loom__error_set(LOOM_EINVALID, "turn options: bad version");
    if (!o->input || o->input->len == 0)
        return loom__error_set(LOOM_EINVALID, "the run has no input");
    if (o->run_id && (!*o->run_id || strlen(o->run_id) > LOOM_ID_MAX))
        return loom__error_set(LOOM_EINVALID, "a run id has 1 to %d bytes",
                               LOOM_ID_MAX);
    if (!(t = calloc(1, sizeof(*t))))
        return loom__error_oom();
    pthread_mutex_init(&t->lock, NULL);
    loom__cond_init(&t->cv);
    atomic_init(&t->refs, 1);
    atomic_init(&t->phase, PH_PREPARED);
    atomic_init(&t->interrupted, 0);
    loom__session_ref(s);
    t->s = s;
    t->sink = o->sink;
    t->ending = o->ending;
    t->ending_payload = o->ending_payload;
    t->log = o->log;
    loom_buf_init(&t->evtext, LOOM_BUF_UNLIMITED);
    t->elicitation = o->elicitation != 0;
    t->log_max = (size_t)(o->log_max_bytes > 0 ? o->log_max_bytes
                                               : LOOM_TURN_LOG_DEFAULT_BYTES);
    if (child) {
        int oom = 0;
        t->tree = loom__agent_tree_ref(child->tree);
        t->depth = child->depth;
        t->parent_cancel = child->cancel;
        t->parent_spend = loom__spend_ref(child->spend);
        t->parent_run_id = dup_or_null(child->parent_run_id, &oom);
        t->parent_call_id = dup_or_null(child->parent_call_id, &oom);
        if (oom) {
            rc = loom__error_oom();
            goto fail;
        }
    }
    if ((rc = pick_agent(t, o, &model)) != 0 ||
        (rc = research_model(t, o, &model)) != 0)
        goto fail;
    if (o->run_id) {
        t->id = strdup(o->run_id);
    } else if ((t->id = malloc(LOOM_ID_SIZE)) != NULL &&
               (rc = loom_id_new(t->id, "run_")) != 0) {
        goto fail;
    }
    if (!t->id) {
        rc = loom__error_oom();
        goto fail;
    }
    if ((rc = loom_session_check_params(
             s, t->agent_cfg ? t->agent_cfg->name : NULL,
             model ? model : loom_session_default_model(s, t->agent_cfg),
             o->params, NULL)) != 0 ||
        (rc = pick_model(t, model)) != 0 || (rc = keep_spec(t, o)) != 0 ||
        (!child && (rc = pick_conversation(t, o)) != 0) ||
        (rc = turn_run_options(t, o, &ro)) != 0 ||
        (rc = loom__run_create(&t->lr, &ro)) != 0 || (rc = place_run(t)) != 0 ||
        (rc = make_durable(t, o, child)) != 0 ||
        (!child &&
         (rc = loom__agent_tree_set_account(t->tree, &o->account)) != 0))
        goto fail;
    /* A resumable research turn's row refers to its conversation from the
     * start: that one is created before, as without the option. */
    if (!child && o->create_with_save && t->create_conversation && !t->durable)
        loom__agent_tree_defer_conversation(t->tree);
    free(model);
    *out = t;
    return 0;
fail:
    free(model);
    loom_turn_free(t);
    return rc;
}

int loom_turn_new(loom_turn **out, loom_session *s, const loom_turn_options *o)
{
    return turn_new(out, s, o, NULL);
}

int loom__turn_new_child(loom_turn **out, loom_session *s,
                         const loom_turn_options *o,
                         const loom__turn_child *child)
{
    if (child && o && (o->conversation_id || o->history))
        return loom__error_set(LOOM_EINVALID,
                               "a sub-agent's turn has no conversation");
    return turn_new(out, s, o, child);
}

/* ---- executing ----------------------------------------------------------- */

/* The tree's conversation (a top turn's own), owned by the turn's user
 * (a sub-agent's turn is for its top turn's user). */
static int op_create(void *arg)
{
    loom_turn *t = arg;

    return loom_store_conversation_create_for(
        t->s->o.store, loom__agent_tree_conversation(t->tree), t->user_id);
}

typedef struct {
    loom_turn *t;
    loom_messages *hist;
} load_ctx;

/*
 * Loads what the conversation carries into the run: the context summary
 * and the plan, then the history. Appends nothing unless it all
 * succeeds, so a retry starts clean.
 */
static int op_load(void *arg)
{
    load_ctx *c = arg;
    loom_turn *t = c->t;
    loom_store *st = t->s->o.store;
    int rc;

    free(t->stored_summary);
    t->stored_summary = NULL;
    json_decref(t->stored_plan);
    t->stored_plan = NULL;
    if ((rc = loom_store_conversation_summary(st, t->conversation_id,
                                              &t->stored_summary,
                                              &t->stored_covers)) != 0 ||
        (rc = loom_store_conversation_plan(st, t->conversation_id,
                                           &t->stored_plan)) != 0)
        return rc;
    return loom_store_load_history(st, t->conversation_id, c->hist);
}

/* Whether the system prompt shows the user's memories: a store, a user
 * and memory on for the agent. */
static int shows_memories(const loom_turn *t)
{
    json_t *as = t->agent_cfg ? json_boolean(t->agent_cfg->memory) : NULL;
    int on = t->s->o.store &&
             loom_memory_tool_offered(LOOM_MEMORY_TOOL_RETRIEVE, t->user_id, as,
                                      t->user_settings, NULL) == 1;

    json_decref(as);
    return on;
}

/* Reads the user's newest memories into the memories section. */
static int op_memories(void *arg)
{
    loom_turn *t = arg;
    loom_store *st = t->s->o.store;
    json_t *found = NULL;
    int64_t total = 0;
    int rc;

    free(t->memories);
    t->memories = NULL;
    if ((rc = loom_store_memory_search(
             st, t->user_id, NULL, LOOM__PROMPT_MEMORIES_MAX, &found)) == 0 &&
        (rc = loom_store_memory_count(st, t->user_id, &total)) == 0)
        rc = loom__prompt_memories(&t->memories, json_object_get(found, "data"),
                                   total);
    json_decref(found);
    return rc;
}

static int op_save(void *arg)
{
    loom_turn *t = arg;
    loom_turn_record rec;
    int rc;

    /* Recorded again on each attempt: only pointers, nothing copied. */
    if ((rc = loom_recorder_turn(t->rec, t->lr, &rec)) != 0)
        return rc;
    rec.run_id = t->id;
    rec.conversation_id = t->depth > 0 ? loom__agent_tree_conversation(t->tree)
                                       : t->conversation_id;
    rec.user_id = t->user_id;
    rec.agent = t->agent;
    rec.input = &t->input;
    rec.parent_run_id = t->parent_run_id;
    rec.parent_call_id = t->parent_call_id;
    rec.depth = t->depth;
    rec.started_at = t->started_ms;
    /* A sub-agent's calls are counted to its top turn's account. */
    rec.account = *loom__agent_tree_account(t->tree);
    rec.create_conversation = t->save_creates;
    return loom_store_save_turn(t->s->o.store, &rec);
}

/* The top turn's save (loom__agent_tree_conversation_write): the turn,
 * and its conversation with it while that is deferred. */
static int save_top(void *arg, int create)
{
    loom_turn *t = arg;

    t->save_creates = create;
    return loom_session_store_retry(t->s, op_save, t, "save_turn");
}

/* A sub-agent's save: the tree's conversation first while deferred. */
static int save_sub(void *arg, int create)
{
    loom_turn *t = arg;
    int rc;

    if (create && (rc = loom_session_store_retry(t->s, op_create, t,
                                                 "create_conversation")) != 0)
        return rc;
    return loom_session_store_retry(t->s, op_save, t, "save_child_run");
}

/*
 * Notes why the turn is not stored (the message is loom_error_last's)
 * and, when the store is what failed, tells the observer.
 */
static void store_failed(loom_turn *t, const char *op, int rc, int counted)
{
    const char *msg = loom_error_last();
    const loom_session_observer *ob = &t->s->o.observer;

    free(t->store_error);
    t->store_error = strdup(*msg ? msg : loom_error_name(rc));
    t->stored = 0;
    if (counted && ob->store_error)
        ob->store_error(op, ob->payload);
    loom_log(LOOM_LOG_ERROR, "run %s: %s failed: %s", t->id, op,
             t->store_error ? t->store_error : loom_error_name(rc));
}

/*
 * Stores a sub-agent's turn as a run linked to its parent, when the tree
 * has a conversation. A failure is logged and counted (op
 * "save_child_run") but changes nothing of the child's outcome nor of its
 * parent's: the parent's turn holds the call and the child's answer
 * either way.
 */
LOOM_NOINLINE static void save_child(loom_turn *t)
{
    int rc;

    if (!t->s->o.store || !loom__agent_tree_conversation(t->tree))
        return;
    if ((rc = loom__agent_tree_conversation_write(t->tree, save_sub, t)) == 0)
        t->stored = 1;
    else
        store_failed(t, "save_child_run", rc, 1);
}

static int op_begin(void *arg)
{
    loom_turn *t = arg;
    loom_store_research_write w;
    char *spec = json_dumps(t->spec, JSON_COMPACT);
    int rc;

    if (!spec)
        return loom__error_oom();
    memset(&w, 0, sizeof(w));
    w.run_id = t->id;
    w.conversation_id = t->conversation_id;
    w.user_id = t->user_id;
    w.spec = spec;
    rc = loom_store_research_put(t->s->o.store, &w);
    free(spec);
    return rc;
}

typedef struct {
    loom_turn *t;
    json_t *stored;
} resume_arg;

static int op_read(void *arg)
{
    resume_arg *a = arg;

    json_decref(a->stored);
    a->stored = NULL;
    return loom_store_research_get(a->t->s->o.store, a->t->id, NULL, 1, 1,
                                   &a->stored);
}

/*
 * An event of the run's from before the stop, up to the step it resumes
 * from (covered: the seq its state accounts for), goes to the recorder
 * as if just sent: the turn stored at the end holds the usage rows, tool
 * outcomes and records of the calls made before the stop. The events
 * after it belong to a step cut short, which runs again.
 */
static void record_kept(loom_turn *t, json_t *j, loom_event_type type,
                        uint64_t seq, uint64_t covered)
{
    loom_event ev;

    if (!t->rec || seq > covered)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.seq = seq;
    ev.index = (uint32_t)json_integer_value(json_object_get(j, "index"));
    ev.run_id = t->id;
    ev.data = j;
    loom_recorder_note(t->rec, &ev);
}

/* The stored events of a resumed turn, back in its log as they were,
 * and those up to covered to its recorder. */
static int preload(loom_turn *t, const json_t *events, uint64_t covered)
{
    const json_t *text;
    uint64_t seq;
    size_t i;

    json_array_foreach(events, i, text)
    {
        json_t *j = json_loads(json_string_value(text), 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        loom_event_type k = LOOM_EV_RUN_STARTED;
        loom_turn_event *e;
        int rc;
        while (type && k < LOOM_EV__COUNT &&
               strcmp(loom_event_type_name(k), type) != 0)
            k++;
        if (!j || k == LOOM_EV__COUNT) {
            json_decref(j);
            continue;
        }
        seq = (uint64_t)json_integer_value(json_object_get(j, "seq"));
        record_kept(t, j, k, seq, covered);
        if (!(e = event_of_json(j, seq, k)))
            return loom__error_oom();
        pthread_mutex_lock(&t->lock);
        rc = log_append(t, e);
        pthread_mutex_unlock(&t->lock);
        if (rc) {
            event_free(e);
            return loom__error_oom();
        }
    }
    return 0;
}

/* The last event seq the stored state accounts for (0: none, as in a
 * state kept before states said). */
static uint64_t kept_seq(const json_t *stored)
{
    const json_t *run =
        json_object_get(json_object_get(stored, "state"), "run");

    return (uint64_t)json_integer_value(json_object_get(run, "seq"));
}

/* A durable turn: its row begins (or, resuming, what was stored comes
 * back into the run and the log), then each step is kept. */
static int keep_research(loom_turn *t)
{
    resume_arg a = {t, NULL};
    int rc;

    if (!t->resuming)
        rc = loom_session_store_retry(t->s, op_begin, t, "begin_research");
    else
        rc = loom_session_store_retry(t->s, op_read, &a, "resume_research");
    if (rc == 0)
        rc = loom__research_keep(t->research, t->lr, t->s->o.store, t->id);
    if (rc == 0 && t->resuming &&
        (rc = preload(t, json_object_get(a.stored, "events"),
                      kept_seq(a.stored))) == 0)
        rc = loom__research_resume(t->research, t->lr, a.stored);
    json_decref(a.stored);
    return rc;
}

/*
 * The store work before the model call, then the run's history: the
 * caller's, or the conversation's from the store (with its summary and
 * plan), then the input. 0, or the error (the turn then fails without
 * calling the model); *op names the step that failed.
 */
LOOM_NOINLINE static int prepare(loom_turn *t, const char **op)
{
    loom_messages hist = {0};
    loom__run_carried carried;
    load_ctx lc = {t, &hist};
    int rc = 0;

    memset(&carried, 0, sizeof(carried));
    if (shows_memories(t)) {
        *op = "load_memories";
        if ((rc = loom_session_store_retry(t->s, op_memories, t, *op)) != 0)
            return rc;
        carried.memories = t->memories;
    }
    if (t->create_conversation &&
        !loom__agent_tree_conversation_deferred(t->tree)) {
        *op = "create_conversation";
        rc = loom_session_store_retry(t->s, op_create, t, *op);
    } else if (t->load_history) {
        *op = "load_history";
        if ((rc = loom_session_store_retry(t->s, op_load, &lc, *op)) == 0) {
            carried.summary = t->stored_summary;
            carried.summary_covers = t->stored_covers;
            carried.plan = t->stored_plan;
        }
    } else if (t->given_history) {
        rc = loom_messages_append(&hist, t->given_history);
    }
    if (rc == 0) {
        *op = "build_run";
        if ((rc = loom_messages_append(&hist, &t->input)) == 0)
            rc = loom__run_begin(t->lr, &hist, &carried);
    }
    loom_messages_free(&hist);
    if (rc == 0 && t->durable) {
        *op = t->resuming ? "resume_research" : "begin_research";
        rc = keep_research(t);
    }
    return rc;
}

/*
 * The final event of a turn whose store work failed: a completed run
 * becomes a run.failed with code "store_failed"; a run that failed anyway
 * keeps its event, which gains "store_error". 0, or -1 when out of memory
 * (the original is kept then).
 */
LOOM_NOINLINE static int mark_unstored(loom_turn *t)
{
    json_t *j = json_copy(t->term_data);
    json_t *msg = loom__json_text(t->store_error, strlen(t->store_error));
    int bad = !j || !msg;

    if (!bad && t->term_type == LOOM_EV_RUN_COMPLETED)
        bad = json_object_set_new(j, "status", json_string("failed")) ||
              json_object_set_new(j, "error",
                                  json_pack("{s:s,s:O}", "code", "store_failed",
                                            "message", msg));
    else if (!bad)
        bad = json_object_set(j, "store_error", msg);
    json_decref(msg);
    if (bad) {
        json_decref(j);
        return -1;
    }
    json_decref(t->term_data);
    t->term_data = j;
    t->term_type = LOOM_EV_RUN_FAILED;
    return 0;
}

/* Logs and passes on the held final event. */
LOOM_NOINLINE static void emit_final(loom_turn *t)
{
    loom_event ev;

    if (!t->term_data)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.type = t->term_type;
    ev.seq = t->term_seq;
    ev.index = t->term_index;
    ev.run_id = t->id;
    ev.data = t->term_data;
    /* The final event goes past the log's limit: it is the one a reader
     * must see. */
    (void)log_event(t, &ev, 1);
    if (t->sink.emit)
        (void)t->sink.emit(&ev, t->sink.payload);
}

static int op_end(void *arg)
{
    keep_arg *a = arg;

    return loom_store_research_put(a->st, &a->w);
}

/* A durable turn's row ends once the turn is stored, with its report
 * and citations. (Should it not, the run is found stored when the
 * server starts and ended then.) */
LOOM_NOINLINE static void end_research(loom_turn *t)
{
    const json_t *cites;
    char *ctext;
    keep_arg a;

    if (!t->durable)
        return;
    cites = loom_run_citations(t->lr);
    ctext = cites ? json_dumps(cites, JSON_COMPACT) : NULL;
    memset(&a, 0, sizeof(a));
    a.st = t->s->o.store;
    a.w.run_id = t->id;
    a.w.end = 1;
    if (loom_run_status_get(t->lr) == LOOM_RUN_COMPLETED)
        a.w.report = loom_run_text(t->lr);
    a.w.citations = ctext;
    if (loom_session_store_retry(t->s, op_end, &a, "end_research"))
        loom_warn("run %s: cannot mark its research ended: %s", t->id,
                  loom_error_last());
    free(ctext);
}

/* Its helpers off the way to the run (prepare, storing, the final event)
 * are LOOM_NOINLINE: this frame stays on the stream's fiber stack while
 * the model streams (384 bytes with them inlined, 64 without). */
int loom_turn_execute(loom_turn *t)
{
    const char *op = NULL;
    int prep, rc = 0, expected = PH_PREPARED;

    if (!atomic_compare_exchange_strong(&t->phase, &expected, PH_PREPARING))
        return loom__error_set(LOOM_EINVALID, "the turn was executed already");
    t->started_ms = loom__unix_ms();
    /* A sub-agent's run is live in its tree while it executes, so that
     * answers to its approvals reach it. */
    if ((prep = prepare(t, &op)) == 0 && t->depth > 0 &&
        (prep = loom__agent_tree_join(t->tree, t->lr, t->parent_run_id,
                                      t->parent_call_id)) != 0)
        op = "build_run";
    if (prep == 0) {
        atomic_store(&t->phase, PH_EXECUTING);
        rc = loom_run_execute(t->lr);
        if (t->depth > 0)
            loom__agent_tree_leave(t->tree, t->lr);
        atomic_store(&t->phase, PH_STORING);
        if (t->depth > 0) {
            /* A sub-agent's turn reports to its parent and ends as its
             * run did, stored or not. */
            save_child(t);
        } else if (t->durable && atomic_load(&t->interrupted)) {
            /* It resumes when loom starts again: nothing is stored. */
            free(t->store_error);
            t->store_error = strdup("interrupted: the research run resumes "
                                    "when the server starts again");
        } else if (!t->s->o.store) {
            /* Nothing to store: the turn ends as its run did. */
        } else if ((prep = loom__agent_tree_conversation_write(
                        t->tree, save_top, t)) == 0) {
            t->stored = 1;
            end_research(t);
        } else {
            store_failed(t, "save_turn", prep, 1);
            if (loom_run_status_get(t->lr) == LOOM_RUN_COMPLETED) {
                t->failed_here = 1;
                t->fail_code = "store_failed";
                rc = prep;
            }
            if (t->term_data && t->store_error)
                (void)mark_unstored(t);
        }
    } else {
        int from_store = strcmp(op, "build_run") != 0;
        atomic_store(&t->phase, PH_STORING);
        store_failed(t, op, prep, from_store);
        t->failed_here = 1;
        t->fail_code = from_store ? "store_failed" : loom_error_name(prep);
        loom__error_set(prep, "%s", t->store_error ? t->store_error : "");
        loom__run_fail(t->lr, prep, t->fail_code);
        rc = prep;
    }
    pthread_mutex_lock(&t->lock);
    t->done = 1;
    pthread_mutex_unlock(&t->lock);
    emit_final(t);
    /* The turn logs no more: its log outlives the text buffer. */
    loom_buf_free(&t->evtext);
    if (t->ending)
        t->ending(t, t->ending_payload);
    pthread_mutex_lock(&t->lock);
    atomic_store(&t->phase, PH_ENDED);
    t->ended = 1;
    loom__cond_broadcast(&t->cv);
    wake_watchers(t);
    pthread_mutex_unlock(&t->lock);
    if (rc && t->failed_here)
        loom__error_set(rc, "%s", t->store_error ? t->store_error : "");
    return rc;
}

static void *turn_thread(void *arg)
{
    loom_turn *t = arg;

    (void)loom_turn_execute(t);
    loom_turn_free(t);
    return NULL;
}

int loom_turn_start(loom_turn **out, loom_session *s,
                    const loom_turn_options *opts)
{
    pthread_attr_t attr;
    pthread_t th;
    loom_turn *t;
    int rc;

    *out = NULL;
    if ((rc = loom_turn_new(&t, s, opts)) != 0)
        return rc;
    loom_turn_ref(t); /* the thread's */
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &attr, turn_thread, t);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        loom_turn_free(t);
        loom_turn_free(t);
        return loom__error_set(LOOM_ERROR, "cannot start a turn thread: %s",
                               strerror(rc));
    }
    *out = t;
    return 0;
}
